"""What the web front and the workers agree on; the part of tasks/ that app/ may import."""
