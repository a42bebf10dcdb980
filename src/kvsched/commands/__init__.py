"""The `kvsched` commands, one module each, loaded when named (kvsched.cli.Group); what
they share (options, consoles, error and output helpers) is kvsched.commands.options."""
