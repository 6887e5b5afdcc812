"""What a model request holds: token budgets, the compacted view, the system prompt (pure;
the compaction step itself is loop/compaction.py)."""
