"""What every stage shares: units and their formatting, file I/O, argument checks and this
machine's memory budget."""
