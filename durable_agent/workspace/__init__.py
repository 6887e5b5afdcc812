"""The workspace as part of the checkpoint: snapshots after every step that can change
files, stored content-addressed in the run's database (store/blobs.py), and what is built on
them: `diff`, `restore`, `fork`, and resume on a host that has nothing but the store.

    manifest.py   Entry, Manifest (path bytes -> entry), tree ids, encoding, changes
    scan.py       Scanner: walk + .gitignore/exclude + stat cache, hashing only what changed
    snapshot.py   take a snapshot: the statements that store its blobs and tree
    materialize.py  write a manifest into a directory (restore)
    recorder.py   the step hooks: before an effect (intent) and after it (outcome),
                  called by the step primitive (loop/step.py) only
    resume.py     on resume: rebuild a missing workspace, stop on drift
    lease.py      one live run per workspace (start, resume)
"""
