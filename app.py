"""TreeGraft: step through tree speculative decoding on real models (placeholder until the app lands)."""

import streamlit as st

st.set_page_config(page_title="TreeGraft", layout="wide")
st.title("TreeGraft")
st.write("A weak and a strong drafter graft one shared draft tree; the target verifies it in one forward pass.")
