"""The terminus-2 compatible agent harness: a persistent terminal in a sandbox, the JSON turn
protocol, and trials that end with the task's verifier."""
