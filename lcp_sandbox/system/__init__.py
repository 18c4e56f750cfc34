"""What the operating system tells, shared by both sides (host and worker):
process trees, exit statuses, memory figures.  Read only, no side effects."""
