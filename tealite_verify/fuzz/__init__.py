"""Time-bounded, crash-isolated fuzzing of every op x backend (``python -m tealite_verify fuzz``).

``findings``   the persistent findings corpus (one JSON file per distinct finding) and replay.
``versions``   the software / hardware versions recorded with every finding and report.
``worker``     one fuzzing process: repeated Hypothesis runs, events as JSON lines.
``supervisor`` spawns and watches the workers (hangs, crashes), saves findings, stops on time.
``report``     progress line, summary table, JSON report and Markdown summary.
"""
