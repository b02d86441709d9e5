"""One module per notebook: its helpers, exercise checkers and widgets."""
