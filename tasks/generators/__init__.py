"""Model adapters: text and video generators behind one small interface (see base.py)."""
