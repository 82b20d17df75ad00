"""Everything that decides "am I distributed, which rank, which device" lives here. Nothing else reads RANK."""
