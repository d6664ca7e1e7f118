// Placeholder so the layer's library exists before its first source lands.
