-- Included by leave.lua, release.lua and acquire.lua (through hand_register.lua): the mark
-- of a waiter whose acquire is over on this node, which refuses its late tries (issue 40,
-- item 10: the phantom holder).
--
-- Why: a waiter's try that a node runs after its leave or release (the try sat on a
-- connection replaced while the node stalled, and the leave came on the newer one) would
-- queue the waiter again, at the head of the line (its ticket is the oldest), and register it
-- for a hand-off; a release would then grant the lock to nobody for the waiter's whole ttl.
-- Nothing in the try tells it from a live one: the node does not share the client's clock,
-- and the undo that follows a lost reply cannot drop the place (a live waiter's replies are
-- routinely not waited for once a round's outcome is known). So the leave or release that
-- ends the acquire here leaves a mark, the string key '<lock key>\0x<H>' (value '1'), H the
-- waiter's hand-off token, and every try with that token is refused while it lives, before it
-- writes anything (acquire.lua, hand_register.lua): H is drawn at random for one acquire
-- (its every round; core/flow.py: Acquire.hand), which sends no try after its leave or
-- release, so the mark refuses only tries that are late. Not the waiter id: its nonce has 32
-- bits, and ids of finished acquires may come again within a mark's life.
--
-- How long it lives (GONE_MS, on the node's clock): the longest a try runs after the leave
-- or release sent behind it on a newer connection. A stalled node, however long it stalls,
-- runs both from its input when it wakes, milliseconds apart (the kernel acknowledged both
-- while the process stood still); a try held back on the network instead is retransmitted by
-- the client's kernel only until it gives up on the closed connection (Linux's
-- tcp_orphan_retries: 8 retransmissions by default, about 51 s from the 200 ms least
-- retransmission timeout). A try later than GONE_MS after its waiter's leave is not refused:
-- the known bound of this rule.
-- Who writes it: a leave, where the waiter had a try whose reply it did not hear (leave.lua's
-- ARGV[3], core/flow.py: Acquire.left_line; a try whose reply was heard has run); and every
-- release by a waiter (release.lua), since the lease cannot tell which of its acquire's tries
-- ran where: a key of its token on a node does not mean its tries ran there (a renewal
-- re-creates the key where a node lost it, and a stalled node runs the renewal and the
-- release from their newer connection before the tries on the replaced one: the simulator,
-- seed 186 of profile storm). A single try (no waiter) writes none. The mark expires by itself:
-- no set to prune; it costs a node one small key per finished waiter for GONE_MS.
-- Reading it costs a try nothing more in the common cases (an EXISTS argument in acquire.lua's
-- fast path; one EXISTS when the waiter has no registration here otherwise).
-- A node out of memory (maxmemory, noeviction) refuses the mark's SET: it is skipped there
-- (pcall), so a release or a leave still frees what it must.
local GONE_MS = 60000

local function gone_key(key, token)
    return key .. '\0x' .. token
end

local function mark_gone(key, token)
    pcall(redis.call, 'SET', gone_key(key, token), '1', 'PX', GONE_MS)
end
