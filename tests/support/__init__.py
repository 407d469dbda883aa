"""Test helpers: api (keys, clients, submit, problems, wait_finished), jobs, workers, procs, generators."""
