"""Pure parts, no processes: discovery (folder rules, schemas, the parse cache),
library lookups by name, result normalization, the confinement policy as data."""
