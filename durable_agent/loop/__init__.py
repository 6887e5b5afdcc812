"""The loop and its steps: runner, model/tool/verify steps, replay, guard, approvals."""
