"""The web view of the store: `durable-agent ui` (docs/ui.md)."""
