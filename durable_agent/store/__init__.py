"""The store: the only package that speaks SQL.

schema.py   tables (mirrors the Alembic head revision)
engine.py   connections, SQLite pragmas and locking, automatic migrations
runs.py     run-level reads and writes without a lease (create, list, cancel, approve, take a lease)
journal.py  checkpoints under a lease: intent/outcome rows, messages, fencing
queue.py    workers claiming runs (FOR UPDATE SKIP LOCKED)
rows.py     shared helpers: the clock, lease owners, message rows
"""
