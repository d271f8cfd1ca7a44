"""The HTTP/SSE gateway: OpenAI, Anthropic, Ollama and Responses APIs over the frontend's gRPC."""
