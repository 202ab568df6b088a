"""Anthropic's Messages API, served as the chat request it translates into."""
