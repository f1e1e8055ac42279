"""The Kopf handlers and their wiring."""
