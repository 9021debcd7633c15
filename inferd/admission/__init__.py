"""Who is calling and whether their request may go on: API keys and tiers, rate limits that follow
capacity, and every refusal before work."""
