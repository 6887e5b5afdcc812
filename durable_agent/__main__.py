from durable_agent.cli.parser import main

raise SystemExit(main())
