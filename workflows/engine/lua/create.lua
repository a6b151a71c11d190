-- needs: engine/lua/create_flow.lua
-- Create a flow unless it exists: engine/lua/create_flow.lua says what it writes and answers.
return create_flow(KEYS, ARGV)
