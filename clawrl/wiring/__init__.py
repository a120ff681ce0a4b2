"""The two processes, each wired in one module: `server` (the gateway and its services) and
`trainer` (the training loop on one or several ranks). Nothing below imports these."""
