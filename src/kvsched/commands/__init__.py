"""The `kvsched` commands other than simulate, one module each, loaded when named
(kvsched.cli.Group); their shared options and helpers are kvsched.cli's."""
