"""The store: the only package that speaks SQL. schema (tables), engine (connections,
pragmas, migrations), journal (checkpoints, leases, fencing)."""
