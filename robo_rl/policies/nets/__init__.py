"""Networks the policies are built from: backbones over action chunks and observation encoders."""
