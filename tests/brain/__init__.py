"""Tests of brain: runs, dispatch and the run lane, the agent loop and delegation, the checked reply,
recovery, the trace."""
