"""What each model family's decoder layer saves for backward, tensor by tensor (the step's data)."""
