from durable_agent.cli import main

raise SystemExit(main())
