"""OpenAI's Responses API, served as the chat request it translates into."""
