"""The DSpark drafter: its config, plain-torch reference, weights and step inputs."""
