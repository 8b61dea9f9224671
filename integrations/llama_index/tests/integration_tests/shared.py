"""Constants of the integration tests (the session client's facts, the answer budget)."""

MAX_NEW_TOKENS = 12
ALICE_FACTS = ["My dog is a beagle named Biscuit.", "I live in Porto."]
BOB_FACTS = ["My cat is a tabby named Whiskers.", "I live in Oslo."]
