"""Test helpers: generators that misbehave on cue, worker subprocesses, throwaway brokers and databases."""
