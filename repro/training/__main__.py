from repro.cliargs import run_entry_point

run_entry_point("repro.training.cli", "repro train")
