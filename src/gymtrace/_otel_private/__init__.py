"""The fence: every use of OpenTelemetry's private names and SDK objects' private fields."""
