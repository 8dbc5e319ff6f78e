"""The control service: its .proto and the committed generated code."""
