"""durable-agent: a coding agent that cannot lose its work.

Every state transition of a run is checkpointed to a SQL database before the next one
begins, so a run killed at any instant resumes from its last verified step.
Start reading at `runner.py` (the loop) and `store/journal.py` (the checkpoints).
"""

__version__ = "0.1.0"
