"""The store: the only package that speaks SQL.

schema.py   tables (mirrors the Alembic head revision)
engine.py   connections, SQLite pragmas and locking, automatic migrations
runs.py     run-level reads and writes without a lease (create, list, cancel, approve, take a lease)
journal.py  checkpoints under a lease: intent/outcome rows, messages, fencing
queue.py    workers claiming runs (FOR UPDATE SKIP LOCKED)
rows.py     shared helpers: the clock, lease owners, message rows
reads.py    RunReads: `list` and `show` behind one interface, whichever way answers
            (sqlite_reads.py: SQLite with the standard library; else runs.py)
prepared.py the checkpoint's statements below Core (journal.py's hot path)
blobs.py    workspace snapshots: blobs, trees, the step's changed files

tests/test_store_conformance.py holds every path here to the same results on both dialects.
"""
