"""What runs in a worker (and in the zygote that forks workers): the worker's
loop, the worker-side proxies, confinement and process limits.

Imported by the zygote before ``gc.freeze()``: nothing here imports the host."""
