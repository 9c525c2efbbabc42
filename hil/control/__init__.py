"""Hand-written controllers: the baseline the policy is compared with and falls back to."""
