"""Generated protobuf modules (scripts/gen-proto): the NRI v0.6.1 API and the ttrpc envelope. Do not edit."""
