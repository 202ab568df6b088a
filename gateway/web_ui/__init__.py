"""MILI's chat page at `/`: a browser client of the server's own API (gateway/web_ui/static/)."""
