"""API dialects: each turns its wire body into the neutral `ApiRequest` and the neutral output
pieces back into its own response and stream events (`gateway/dialects/<api>.py`)."""
