"""Moving data in and out: the export format, import, copy between databases, importers
for the stores agentstate replaces. Maintenance commands, not a slice of the API."""
