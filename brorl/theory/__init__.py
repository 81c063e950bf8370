"""Mass-balance theory (BroRL §2, App. C) and the token-level simulator (§4.1)."""
