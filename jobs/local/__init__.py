"""`tierq up`: the whole system as child processes on one machine."""
