"""Several vLLM servers behind one gateway (`engine.vllm.urls`): engine.py, routing.py, versions.py."""
