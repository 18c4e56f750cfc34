"""What runs a binding's libraries: the interface (base.py) and its implementations."""
