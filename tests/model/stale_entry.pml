/*
 * A Promela model of exclusive releases without a done mark (docs/protocol.md §5, §10, §11),
 * checked with spin (tests/model/check.sh): a released exclusive request's entry stays live in its
 * session's record, carrying the generation (word1's) of its grant, and lockd's reap of an ended
 * session acts on an entry only while the slot is still in the entry's generation.
 *
 * What it models: one slot, exclusive requests only (word0 = nX, maxX; nS = maxS = 0 are left
 * out), word1's generation, and COUNT_MAX = CMAX (tiny) so that the counters are reset within the
 * bounds. NS sessions (one thread each) take the lock ROUNDS times:
 *   - acquire: FETCH_AND_ADD on word0 draws ticket px (the maxX it found); granted at once if
 *     nX == px. A ticket of a frozen word (px >= CMAX) is withdrawn at once and the request backs
 *     off and tries again. Here that is one blocking step: the FA waits while the word is frozen
 *     and not drained; on a frozen, drained word the bounce leaves it so, and the request resets
 *     it, then tries again. Safe to simplify: a bounce's increment is in the word only between its
 *     two operations, where it only decides who finds the word drained (the releaser or the
 *     bouncer); here the releaser does, and its reset may be as slow as any schedule makes it.
 *     Each reset attempt follows a zeroing of word0, so the generation stays bounded (with real
 *     bounces two requesters can defeat each other's reset for ever: rdmalock.pml's MAXBOUNCE);
 *   - the request's entry: WRITE (ticket, generation) into the session's record. It is posted
 *     after the FA and lands before the release (same QP), so here it lands either before the
 *     wait or after the grant. The generation written is any value from 0 up to word1's
 *     generation at that moment: the SDK writes a generation from its per-slot cache of values it
 *     READ earlier, exact or older (generations only grow). The range also holds values newer
 *     than word1's at the FA (a racing resetter's late bump may land between the FA and the
 *     write): any value word1 showed before the release is safe. Each round has an entry of its own
 *     (the pool may hand out another entry each time; reusing one only overwrites a stale one).
 *     A request may write its entry a second time after its grant (LockEngine::Wait corrects an
 *     entry whose generation is older than the one its grant's READ saw): again any value up to
 *     word1's generation, so the model's second write covers the correction and more;
 *   - wait until nX == px (a READ of word0, as a blocking step: in this model a live request is
 *     never skipped nor reset, since there is no stall recovery), then hold;
 *   - release: the conditional CAS (nX == px && maxX > px: nX + 1), with NO done mark: the entry
 *     stays live for as long as the session lives;
 *   - whoever's operation (a release, a bounce, lockd's release) leaves the word frozen and
 *     drained (maxX >= CMAX, nX == maxX) resets it: FA(word1, generation + 1), then
 *     CAS(word0, drained, 0), two steps: several participants may race, one CAS wins, and a
 *     loser's bump may land late, after the next generation's first tickets.
 * lockd may end one session at any moment (the fence: the session takes no more steps, and
 * nothing it posted lands later), take the entries its record shows, and reap each in rounds
 * interleaved with the other sessions, as LockEngine::Reap does: READ the slot (word0, then word1:
 * a 16-byte READ is not one atomic snapshot); drop the entry if word1's generation is not the
 * entry's (FIX_GEN), or its ticket is gone (maxX <= px) or skipped (nX > px); release it with the
 * conditional CAS if it is granted (nX == px); otherwise look again in the next round.
 *
 * Properties (assertions):
 *  - lockd's reap releases only a ticket of the session it reaps: never the grant of a session
 *    that is still live (one that has neither released nor been ended);
 *  - never two live holders at once; a live holder's grant always still stands (its own release
 *    finds it, and a waiter's turn is never taken from it);
 *  - no invalid end state other than a session waiting for ever behind the ended session's
 *    grant that lockd could not release (its entry not written yet, or dropped for another
 *    generation: a stale cached one, or even the exact one after a racing resetter's late bump
 *    moved word1 on during the grant): the waiters' stall recovery (not modelled) takes over.
 *
 * One assumption, as rdmalock.pml's about delayed operations: a reset's CAS never lands in a later
 * generation than the one whose drained word it saw (ghost `ep`). It compares word0 with the
 * drained word, and every generation's drained word is the same (nX = maxX = COUNT_MAX), so a CAS
 * delayed past a whole generation would zero the next one's drained word before that
 * generation's own bump landed, and two generations would share one value of word1. In the real
 * word that needs the CAS held up for 32,768 grants (the residual risk of §3). RESET_ABA=1 drops
 * the assumption: with NS=2 ROUNDS=3 (three generations) spin then finds lockd releasing a live
 * session's grant (about 10 million states, 12 s).
 *
 * Mutants (each must make spin find a violation):
 *  - FIX_GEN=0: lockd's reap ignores the generation: a released entry's ticket number recurs
 *    after a reset, and lockd releases a later holder's grant;
 *  - STALE_NEWER=1: the client may write a generation one NEWER than word1's: the next
 *    generation's value, so after a reset the stale entry matches again (the safety argument
 *    needs the written value to be at most the grant's);
 *  - W1_FIRST=1: lockd reads word1 before word0 (with time between them): word1 of the entry's
 *    generation beside word0 of a later one. In the engine both are one 16-byte READ: between
 *    its two 8-byte halves the rest of the entry's generation would have to be served, the word
 *    reset and the ticket drawn again, on the order of 32,768 operations.
 *
 * Run: spin -a stale_entry.pml && gcc -O2 -DSAFETY -o pan pan.c && ./pan
 */
#ifndef NS
#define NS 2
#endif
#ifndef ROUNDS
#define ROUNDS 2
#endif
#ifndef CMAX
#define CMAX 2
#endif
#ifndef FIX_GEN
#define FIX_GEN 1
#endif
#ifndef STALE_NEWER
#define STALE_NEWER 0
#endif
#ifndef W1_FIRST
#define W1_FIRST 0
#endif
#ifndef RESET_ABA
#define RESET_ABA 0
#endif
#define NE (NS * ROUNDS)

byte nX, mX;     /* word0: exclusive releases, exclusive tickets issued */
byte gen;        /* word1's generation */

/* The session records: entry k = s * ROUNDS + round (ticket, generation), written or not. */
bool e_w[NE];
byte e_tk[NE];
byte e_gen[NE];

bool ended[NS];  /* lockd ended (fenced) the session */

/* ghost state for the properties */
bool holding[NS];     /* granted and not yet released */
byte ep;              /* word0 zeroings so far (the reset CAS assumption) */

/* A reset by the participant that produced a frozen, drained word dx (seen at zeroing count
 * rep): the generation first, then the CAS to zero, on one QP so they land in that order. */
inline reset_if_drained(dr, dx, rep) {
  if
  :: dr ->
     gen++;
     atomic {
       if
       :: nX == dx && mX == dx && (RESET_ABA || ep == rep) -> nX = 0; mX = 0; ep++
       :: else -> skip  /* another participant's CAS won */
       fi;
       dr = false; dx = 0; rep = 0
     }
  :: else -> skip
  fi
}

/* The entry's WRITE: the ticket and a generation from the cache, exact or older. */
inline write_entry(k) {
  atomic {
    c = 0;
    do
    :: c < gen -> c++
    :: break
    od;
#if STALE_NEWER
    if
    :: c == gen -> c++  /* the mutant: newer than any generation word1 has shown */
    :: skip
    fi;
#endif
    e_tk[k] = px; e_gen[k] = c; e_w[k] = true; c = 0; written = true
  }
}

/* The session observes its grant: never two live holders at once. */
inline observe_grant() {
  j = 0;
  do
  :: j < NS -> assert(j == me || !holding[j] || ended[j]); j++
  :: else -> break
  od;
  j = 0;
  holding[me] = true
}

proctype Session(byte me) {
  byte r = 0, px, c, dx, rep, j;
  bool dr, written;
  {
    do
    :: r < ROUNDS ->
end_acquire:
       atomic {
         /* FETCH_AND_ADD(word0, 1 << 16). A ticket of a frozen word is withdrawn at once and the
          * request backs off and tries again: here a blocking step, until the word is not frozen
          * or is drained (then the withdrawal left it frozen and drained: we reset it). */
         mX < CMAX || nX == mX ->
         if
         :: mX < CMAX ->
            px = mX; mX++;
            if
            :: nX == px -> observe_grant()  /* granted at once */
            :: else -> skip
            fi
         :: else -> dr = true; dx = mX; rep = ep
         fi
       }
       if
       :: dr -> reset_if_drained(dr, dx, rep); goto end_acquire
       :: else -> skip
       fi;
       if
       :: write_entry(me * ROUNDS + r)  /* the entry lands before the wait */
       :: skip                          /* or only after the grant */
       fi;
end_wait:
       atomic {  /* READs of word0 until our turn */
         holding[me] || !(nX < px && mX > px) ->
         assert(nX == px && mX > px);  /* a live request is never skipped nor reset */
         if
         :: !holding[me] -> observe_grant()
         :: else -> skip
         fi
       }
       if
       :: !written -> write_entry(me * ROUNDS + r)
       :: written -> skip
       :: written -> write_entry(me * ROUNDS + r)  /* again: a waiter's correction (above) */
       fi;
       /* the critical section; then the release: the CAS alone, no done mark (the entry stays) */
       atomic {
         assert(nX == px && mX > px);  /* a live holder's grant still stands */
         holding[me] = false;
         nX++;
         dr = (mX >= CMAX && nX == mX); dx = mX; rep = ep;
         px = 0; written = false; r++
       }
       reset_if_drained(dr, dx, rep)
    :: else -> break
    od
  } unless { ended[me] }  /* fenced: no more steps, and nothing posted lands later */
}

proctype Lockd() {
  byte s, i, n, j, px, eg, rnx, rmx, rg, dx, rep;
  bool dr, pend[ROUNDS], act;
  /* End one session (any, at any moment) and take the entries its record shows (fenced, the
   * record no longer changes). */
  atomic {
    if
    :: s = 0
    :: s = 1
#if NS > 2
    :: s = 2
#endif
    fi;
    ended[s] = true;
    i = 0;
    do
    :: i < ROUNDS -> pend[i] = e_w[s * ROUNDS + i]; i++
    :: else -> break
    od;
    i = 0
  }
  /* Reap: step each pending entry in turn (LockEngine::Reap), until none is left. */
  do
  :: atomic {  /* the next pending entry, round robin (lockd's own memory) */
       n = 0;
       do
       :: n < ROUNDS && !pend[i] -> i = (i + 1) % ROUNDS; n++
       :: else -> break
       od;
       if
       :: n == ROUNDS -> i = 0; n = 0; break  /* all reaped */
       :: else -> n = 0; px = e_tk[s * ROUNDS + i]; eg = e_gen[s * ROUNDS + i]
       fi
     }
#if W1_FIRST
     rg = gen;                        /* the mutant: word1 first, */
     atomic { rnx = nX; rmx = mX };   /* then word0 */
     atomic {
#else
     atomic { rnx = nX; rmx = mX };   /* the READ: word0, */
     atomic {
       rg = gen;                      /* then word1 */
#endif
       act = false;
       if
       :: (FIX_GEN && rg != eg) || rmx <= px || rnx > px ->
          pend[i] = false  /* another generation, gone or skipped: dropped */
       :: else ->
          if
          :: rnx == px -> act = true
          :: else -> skip  /* waiting: look again next time round */
          fi
       fi;
       rnx = 0; rmx = 0; rg = 0
     }
     if
     :: act ->
        /* granted: the release CAS loop, while the word still shows the grant */
        atomic {
          if
          :: nX == px && mX > px ->
             j = 0;  /* never a live session's grant */
             do
             :: j < NS -> assert(!(holding[j] && !ended[j])); j++
             :: else -> break
             od;
             j = 0;
             nX++;
             dr = (mX >= CMAX && nX == mX); dx = mX; rep = ep
          :: else -> dr = false
          fi;
          act = false; pend[i] = false
        }
        reset_if_drained(dr, dx, rep)
     :: else -> skip
     fi;
     atomic { px = 0; eg = 0; i = (i + 1) % ROUNDS }
  od
}

init {
  byte i = 0;
  atomic {
    do
    :: i < NS -> run Session(i); i++
    :: else -> break
    od;
    run Lockd()
  }
}
