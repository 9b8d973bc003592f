"""Runtime drivers: one interface (base.Runtime), several implementations."""
