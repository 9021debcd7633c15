"""The API's OpenAPI document: its paths (`document`), the named schemas they refer to (`schemas`), the
parts they share (`parts`) and the examples the interactive page sends (`examples`); data, built once."""
