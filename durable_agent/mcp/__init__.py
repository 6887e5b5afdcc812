"""MCP servers as tool sources (extra `durable-agent[mcp]`)."""
