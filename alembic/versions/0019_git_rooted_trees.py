"""Trees stored as the differences from a git commit: with `snapshot_baseline = "git"`, a
whole manifest (a tree with no `base`) may now be kept as what differs from the files of
the commit `workspace_trees.git` records, read back from the repository's listing
(workspace/manifest.encode_head, docs/data.md). No table changes: this revision tells a
release that cannot read such a tree that the store is newer than it knows, so it refuses
to open it and its workers claim nothing more (docs/versions.md), rather than taking those
trees for damaged ones.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    # (the trees stay as they are: a release at 0018 reads those stored as differences from
    # a commit as damaged, one line each, and every other tree as before)
    pass
