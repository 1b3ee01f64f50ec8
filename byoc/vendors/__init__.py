"""Built-in vendor integrations, each a backend specification plus its codegen and runtime."""
