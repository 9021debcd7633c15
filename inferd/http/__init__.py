"""The network side: HTTP routes and handlers, the wire formats (inferd's, OpenAI's), responses written
whole, and the HAProxy agent-check port."""
