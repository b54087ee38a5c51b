"""Tests of consent: cards, execution tokens, remembered consent."""
