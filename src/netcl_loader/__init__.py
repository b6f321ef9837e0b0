"""netcl_loader."""
